"""Builds the native libnftnl shim (nlproxy._nftshim) with cffi; metadata lives in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["native/build_nftshim.py:ffibuilder"])
