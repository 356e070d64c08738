"""Pure math of positional encodings: no model, no config object, only numbers in and tensors out."""
