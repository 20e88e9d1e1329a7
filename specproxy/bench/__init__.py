"""``specproxy bench``: what a relay in front of a streaming engine costs, side by side in one run.

Separate processes, as in production: a stamping upstream (:mod:`.upstream`), the relays under test (specproxy with
one or N workers, nginx), and load-generating clients (:mod:`.client`), so that none shares another's GIL. The
upstream stamps each SSE event with its send time on ``CLOCK_MONOTONIC``; the client subtracts on receipt, so every
event's transit is measured, direct and through each relay. :mod:`.run` drives the levels, :mod:`.hostile` the
hostile inputs, :mod:`.render` prints.
"""
