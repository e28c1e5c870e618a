"""Packaging for subwabbit."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version() -> str:
    """The version, from the one place it is defined."""
    scope: dict = {}
    with open(os.path.join(HERE, "subwabbit", "version.py"), encoding="utf-8") as handle:
        exec(handle.read(), scope)  # pylint: disable=exec-used
    return scope["__version__"]


with open(os.path.join(HERE, "README.rst"), encoding="utf-8") as readme:
    LONG_DESCRIPTION = readme.read()

setup(
    name="subwabbit",
    version=read_version(),
    description="Serve Vowpal Wabbit models from Python within a latency budget",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/x-rst",
    license="BSD-3-Clause",
    packages=find_packages(include=["subwabbit", "subwabbit.*"]),
    package_data={"subwabbit": ["py.typed"]},
    python_requires=">=3.9",
    install_requires=["vowpalwabbit>=9.0,<10"],
    extras_require={
        "test": ["pytest>=7", "numpy>=1.23", "pandas>=1.5", "fastapi>=0.100", "uvicorn>=0.23",
                 "gunicorn>=21", "prometheus_client>=0.17", "dask[distributed]>=2023.1",
                 "matplotlib>=3.6"],
        "prometheus": ["prometheus_client>=0.17"],
        "service": ["fastapi>=0.100", "uvicorn>=0.23", "prometheus_client>=0.17"],
        # subwabbit.distributed: training on many workers with VW's AllReduce
        "dask": ["dask[distributed]>=2023.1"],
        "docs": ["sphinx>=7", "furo>=2024.1.29"],
        "bench": ["numpy>=1.23", "pandas>=1.5", "matplotlib>=3.6"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
)
