"""What tests push: tiny PEFT adapter files, the tiny model's random adapters, pushes the
store must refuse, pushes as adapterctl makes them, signing material, and adapterctl
run in-process."""

__all__ = ["badpushes", "ctl", "files", "models", "pushes", "signers"]
