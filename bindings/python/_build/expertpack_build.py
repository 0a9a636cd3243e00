"""The PEP 517 build backend of the expertpack package: the package is pure Python (ctypes), so its wheel is
a zip of expertpack/ and its metadata, made here with the standard library. Nothing needs downloading to
build it, so `pip install bindings/python` works offline (setuptools' backend would fetch setuptools and
wheel first). The metadata comes from pyproject.toml's [project] table."""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TAG = "py3-none-any"


def _project():
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def value(key):
        m = re.search(rf'^{key}\s*=\s*"([^"]*)"', table, re.M)
        if not m:
            raise ValueError(f"pyproject.toml: [project] has no {key}")
        return m.group(1)
    extras = re.findall(r'^(\w+)\s*=\s*\["([^"]+)"\]', text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0],
                        re.M) if "[project.optional-dependencies]" in text else []
    return value("name"), value("version"), value("description"), value("requires-python"), extras


def _metadata():
    name, version, summary, requires_python, extras = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}",
             "License: Apache-2.0", f"Requires-Python: {requires_python}"]
    for extra, req in extras:
        lines += [f"Provides-Extra: {extra}", f'Requires-Dist: {req}; extra == "{extra}"']
    readme = os.path.join(_ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return name, version, "\n".join(lines) + "\n" + body


def _package_files():
    pkg = os.path.join(_ROOT, "expertpack")
    return sorted(os.path.join("expertpack", n) for n in os.listdir(pkg) if n.endswith(".py"))


def _write_wheel(wheel_directory, files):
    """files: (archive name, bytes). Adds the dist-info and RECORD; returns the wheel's name."""
    name, version, metadata = _metadata()
    dist_info = f"{name}-{version}.dist-info"
    files = list(files) + [(f"{dist_info}/METADATA", metadata.encode()),
                           (f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: expertpack_build\nRoot-Is-Purelib: true\n"
                                                  f"Tag: {_TAG}\n".encode())]
    record = []
    wheel_name = f"{name}-{version}-{_TAG}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            z.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for rel in _package_files():
        with open(os.path.join(_ROOT, rel), "rb") as f:
            files.append((rel.replace(os.sep, "/"), f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts this folder on sys.path: edits to expertpack/ take effect at once.
    return _write_wheel(wheel_directory, [("expertpack_editable.pth", (_ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, metadata = _metadata()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", os.path.join("_build", "expertpack_build.py")] + _package_files():
            path = os.path.join(_ROOT, rel)
            if os.path.exists(path):
                t.add(path, arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = metadata.encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return out
