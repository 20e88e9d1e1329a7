"""specproxy: does speculative decoding pay off for *your* traffic, and how fast does your server really stream?"""

__version__ = "0.1.0"
