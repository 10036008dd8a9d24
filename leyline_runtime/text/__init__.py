"""Text: the tokenizer and the chat template (how messages become tokens, and back)."""
