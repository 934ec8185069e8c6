"""Helpers the library and its launchers share, which import nothing of either:
:mod:`.ports` (free TCP ports and who holds a taken one)."""
