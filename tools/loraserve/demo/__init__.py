"""`make run`: the whole loraserve stack on one machine, with a demo model and adapters."""
