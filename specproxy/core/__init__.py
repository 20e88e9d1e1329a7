"""The pure core: bytes and numbers in, values out. No sockets, no files, no clock reads."""
