"""Attacks that try to bring erased facts back; one file each, each citing its paper."""
