"""Client-side tools: the stdio bridge that connects an editor to a broker."""
