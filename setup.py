"""Maps the `loraserve` namespace onto the service folders.

Each folder under `services/` holds a part of the `loraserve` namespace package
(`loraserve.adapterstore`, `loraserve.inference`, and the shared `loraserve.common`);
static pyproject configuration cannot find one namespace across several roots.
"""

from setuptools import find_namespace_packages, setup

ROOTS = (
    "services/common",
    "services/adapterstore",
    "services/inference",
    "services/adapterctl",
)

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    for package in find_namespace_packages(root, include=["loraserve.*"]):
        packages.append(package)
        package_dir[package] = f"{root}/{package.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
