"""specproxy: does speculative decoding pay off for *your* traffic, and how fast does your server really stream?"""

from specproxy.compiled import prefer_source, pure_requested

__version__ = "0.1.0"

if pure_requested():  # SPECPROXY_PURE: the per-event modules' .py files even where compiled ones are installed
    prefer_source()
