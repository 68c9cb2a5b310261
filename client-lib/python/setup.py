# SPDX-License-Identifier: MIT
"""The C extension of the rdmax package; metadata lives in pyproject.toml."""
import os

from setuptools import Extension, setup

prefix = os.environ.get("RDMAX_PREFIX", "/usr/local")
setup(ext_modules=[Extension(
    "rdmax._rdmax", ["_rdmax.c", "jobs.c", "regions.c"],
    include_dirs=[os.path.join(prefix, "include")],
    library_dirs=[os.path.join(prefix, "lib")],
    runtime_library_dirs=[os.path.join(prefix, "lib")],
    libraries=["rdmax"],
    extra_compile_args=["-std=gnu11"],
)])
