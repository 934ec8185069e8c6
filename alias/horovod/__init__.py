"""Horovod's module names on hvdcompat (installed by hvdcompat-horovod-alias).

Everything lives in hvdcompat.horovod_alias (see its Note [Horovod alias]);
this file only lets an installed ``horovod`` package reach it.
"""

from hvdcompat.horovod_alias import fill_package

fill_package(globals())
del fill_package
