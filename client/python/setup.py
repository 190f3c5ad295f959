"""Builds the prefixd package with its gRPC stubs (pyproject.toml holds the
metadata). build_py runs gen_stubs.py on ../../proto into the build tree's
prefixd/v1, so the installed package carries prefixd.v1.*_pb2 and needs
neither the source tree nor $PREFIXD_PYTHON_STUBS; the source tree itself
never holds generated code."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, HERE)
        import gen_stubs  # client/python/gen_stubs.py
        gen_stubs.generate(self.build_lib)


setup(cmdclass={"build_py": BuildPyWithStubs})
