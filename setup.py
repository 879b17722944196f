"""Build of the kernels' C extension; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "qpart.kernels._native",
            sources=["kernels/_native.c"],
            depends=["kernels/_native_loops.h"],  # included once per instruction-set level
            # -ffp-contract=off: no FMA fusion, so float results match the numpy reference bit for bit.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno", "-std=c11"],
            optional=True,
        )
    ]
)
