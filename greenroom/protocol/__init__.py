"""Floor 1: pure data. msgspec Structs for session events, model streams and
requests; no Trio, no behaviour beyond what a value can say about itself."""
