"""The model itself, readable and exact: config, masks, attention, the layer recipe, the encoder,
weights, tokenizer, checkpoint reading, parameter counts. Imports nothing above it."""
