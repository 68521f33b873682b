"""What an adapter revision is, on every side: its manifest, names and `NAME@REV`
references, the PEFT files and the values they may hold, and its presigned download URLs."""

__all__ = ["lora_values", "manifest", "names", "peft_format", "presigned"]
