"""Build the optional C extension; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kernelflow._paths",
            sources=["src/kernelflow/_native/paths.c"],
            depends=["src/kernelflow/_native/paths_impl.h", "src/kernelflow/_native/prox_impl.h"],
            extra_compile_args=["-O3", "-fno-math-errno"],
            optional=True,  # without a C compiler the package falls back to tensor code
        )
    ]
)
