"""The model itself, readable and exact: config, masks, attention, the layer recipe, the encoder
and its outputs, the classifier, weights, tokenizer, words, checkpoint reading, parameter
counts. Imports nothing above it."""
