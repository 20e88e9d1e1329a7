"""``specproxy matrix``: the published experiment in one command. For each server configuration of a matrix file,
start it (or reach it), wait until healthy, warm up, send every workload's requests for every repeat through the
load generator's recorder, stop it with all its children; at the end, the comparison table per workload and the
advice on k.

Layers, each importing only the ones above it: ``spec`` (pure: the file's content, placeholders), ``load`` (reading
the file, the shipped examples), ``plan`` (pure: the one request list), ``server`` (a process group, health, stop),
``results`` (the folder, the manifest), ``progress`` (pure: where it is, time left), ``runner`` (the
configurations one by one), ``report`` (pure: the tables), ``session`` (a whole command).
"""
