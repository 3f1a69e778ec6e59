"""Package discovery for the one thing pyproject.toml cannot say: three source folders
(`accelify/`, `rules/`, `runtime/`) that install as one `accelify` package.

Every package under each folder is found, so a new subpackage ships without a list to update.
All other metadata lives in pyproject.toml.
"""

from setuptools import find_packages, setup

SOURCE_FOLDERS = {
    "accelify": "accelify",
    "accelify.rules": "rules",
    "accelify.runtime": "runtime",
}


def packages() -> list[str]:
    found = []
    for package, folder in SOURCE_FOLDERS.items():
        found.append(package)
        found += [f"{package}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=packages(), package_dir=SOURCE_FOLDERS)
