"""Builds the weightcast wheel: the pure-Python package plus
libweightcast.so (built first by `make python`). One wheel serves every
Python 3 version of its platform, since the package reaches the library
through ctypes, not a compiled extension: the tag is py3-none-<platform>.

    make wheel     # writes dist/weightcast-<version>-py3-none-linux_<arch>.whl
"""

import os
import platform
import re

from setuptools import setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = re.search(r'__version__ = "([^"]+)"', open(os.path.join(HERE, "weightcast", "__init__.py")).read()).group(1)

if not os.path.exists(os.path.join(HERE, "weightcast", "libweightcast.so")):
    raise SystemExit("weightcast/libweightcast.so is missing: run `make python` first")


class BinaryDistribution(Distribution):
    """A distribution with a platform library in it."""

    def has_ext_modules(self):
        return True


cmdclass = {}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return "py3", "none", "linux_" + platform.machine()

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # building only an sdist
    pass

setup(
    name="weightcast",
    version=VERSION,
    description="Stream model weights from one rank to many (Python over libweightcast.so)",
    packages=["weightcast"],
    package_data={"weightcast": ["libweightcast.so", "weightcast.h"]},
    python_requires=">=3.8",
    # numpy for host buckets; torch is optional (imported when the caller
    # uses it): 1.13 and 2.x are supported, CUDA tensors need a CUDA build.
    install_requires=["numpy>=1.21"],
    extras_require={"torch": ["torch>=1.13"]},
    distclass=BinaryDistribution,
    cmdclass=cmdclass,
    zip_safe=False,
)
