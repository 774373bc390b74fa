"""What the synthesize and validate stages call: the synthesizers' shared loop, the LLM synthesizer and its
endpoint client and reply parsers, the LLM judge, and query similarity."""
