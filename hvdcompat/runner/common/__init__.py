"""What both ends of a launch share (Horovod's ``horovod.runner.common``): :mod:`.channel`,
the authenticated channel between ``hvdcompat.run``'s driver and its ranks."""
