"""Maps the `loraserve` namespace onto the service folders.

Each folder under `services/` holds a part of the `loraserve` namespace package
(`loraserve.adapterstore`, `loraserve.inference`, and the shared `loraserve.common` with
the generated stubs of both contracts); static pyproject configuration cannot find one
namespace across several roots. A package may span roots (`loraserve.adapterstore` is the
service in its own root and only the folder above `v1/` in the shared one): it maps to the
one root that holds its modules.
"""

from pathlib import Path

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
        directory = f"{root}/{package.replace('.', '/')}"
        if not any(path.is_file() for path in Path(directory).iterdir()):
            continue
        if package in package_dir:
            raise SystemExit(f"{package} has modules in {package_dir[package]} and {directory}")
        packages.append(package)
        package_dir[package] = directory

setup(packages=packages, package_dir=package_dir)
