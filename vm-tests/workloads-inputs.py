#!/usr/bin/env python3
"""Build the inputs of the workloads suite (vm-tests/suites/workloads.sh) from
packages fetched with the ordinary clients, cached under build/workloads/.

Usage: vm-tests/workloads-inputs.py [--files N] [--packages K] [--tx T]
                                    [--rows R] [--cache DIR]

Prints two lines, "tree PATH" and "inputs PATH": two uncompressed tar files
the suite's setup attaches to the guest as read-only virtio-blk disks.

tree    The source tree to untar: Debian's linux-source-6.1 (apt-get download
        of the candidate version; the package holds the kernel tree as a
        tar.xz), cut to its first N regular files of at most 16 KiB each in
        the tarball's order (N = 50,000 is the full size), with the
        directories and symbolic links met on the way. Cached per package
        version and N. Debian's "ignore everything" block at the end of the
        top-level .gitignore is dropped (git status would not look for
        untracked files at all with it).
inputs  Everything else, small: `params` (shell variables the guest sources:
        the tree's counts, the storm's and SQLite's sizes), and the npm-style
        storm: a real dependency tree (vm-tests/workloads/package.json and its
        lock, installed on the host by `npm ci --ignore-scripts` once per
        lock), its first K packages in the lock's order, each as a .tgz of the
        files npm extracted for it (`npm/NNNN.tgz`, entries under package/),
        `layout` (NNNN and the package's path under node_modules, nesting
        included), `probes` (the stat and read calls of Node's CommonJS
        resolution of every dependency of every package, replayed by `fsops
        probe`) and `manifest` (sha256 of every storm file). Cached per lock,
        K, T, R and tree.
"""
import argparse
import hashlib
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TREE_PACKAGE = "linux-source-6.1"
TREE_MAX_FILE = 16 * 1024  # bytes: the cut keeps ordinary source files, not the huge generated headers
# Debian's packaging appends to the top-level .gitignore a block that ignores
# everything at the top level ("/*"): git status would then never look for
# untracked files. The cut drops that block (upstream's .gitignore is left).
DEBIAN_GITIGNORE_BLOCK = b"\n#\n# Debian packaging:"
CUT_FORMAT = 2  # in the cache key: bump when the cut changes
NODE_EXTS = (".js", ".json", ".node")  # Module._extensions, in Node's order


def log(msg):
    print(f"workloads-inputs: {msg}", file=sys.stderr)


def run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"workloads-inputs: {' '.join(cmd)} failed: {e}")


def atomic_dir_file(path):
    """A temp name next to path, renamed over it once complete."""
    return f"{path}.tmp.{os.getpid()}"


# ------------------------------------------------------------------ the tree


def candidate_version(pkg):
    for attempt in (0, 1):
        out = run(["apt-cache", "policy", pkg])
        for line in out.splitlines():
            if line.strip().startswith("Candidate:"):
                ver = line.split(":", 1)[1].strip()
                if ver and ver != "(none)":
                    return ver
        if attempt == 0:
            log("apt-get update (no candidate for %s yet)" % pkg)
            run(["apt-get", "update", "-qq"])
    sys.exit(f"workloads-inputs: no apt candidate for {pkg}")


def fetch_deb(cache, pkg, ver):
    """apt-get download PKG=VER once into CACHE/deb; older versions removed."""
    d = os.path.join(cache, "deb")
    os.makedirs(d, exist_ok=True)
    want = f"{pkg}_{ver.replace(':', '%3a')}_all.deb"
    path = os.path.join(d, want)
    if not os.path.exists(path):
        for old in os.listdir(d):
            if old.startswith(pkg + "_"):
                os.remove(os.path.join(d, old))
        log(f"apt-get download {pkg}={ver}")
        subprocess.run(["apt-get", "download", "-q", f"{pkg}={ver}"], cwd=d, check=False,
                       stdout=sys.stderr, stderr=subprocess.DEVNULL)
        if not os.path.exists(path):
            run(["apt-get", "update", "-qq"])
            run(["apt-get", "download", "-q", f"{pkg}={ver}"], cwd=d)
        if not os.path.exists(path):
            sys.exit(f"workloads-inputs: apt-get download {pkg}={ver} left no {path}")
    return path


def cut_tree(deb, out, nfiles):
    """The first NFILES regular files of at most TREE_MAX_FILE bytes of the
    .deb's kernel tarball, with the directories and symlinks met on the way,
    into the uncompressed tar OUT. Returns the counts."""
    counts = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0, "top": ""}
    dpkg = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
    tmp = atomic_dir_file(out)
    with tarfile.open(fileobj=dpkg.stdout, mode="r|") as outer, tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as dst:
        for m in outer:
            if not m.name.endswith(".tar.xz"):
                continue
            with tarfile.open(fileobj=outer.extractfile(m), mode="r|xz") as inner:
                for e in inner:
                    if e.isdir():
                        dst.addfile(e)
                        counts["dirs"] += 1
                    elif e.issym():
                        dst.addfile(e)
                        counts["symlinks"] += 1
                    elif e.isreg() and e.size <= TREE_MAX_FILE:
                        data = inner.extractfile(e).read()
                        if e.name.count("/") == 1 and e.name.endswith("/.gitignore"):
                            data = data.split(DEBIAN_GITIGNORE_BLOCK)[0] + b"\n"
                            e.size = len(data)
                        dst.addfile(e, io.BytesIO(data))
                        counts["files"] += 1
                        counts["bytes"] += len(data)
                    else:
                        continue
                    counts["top"] = counts["top"] or e.name.split("/")[0]
                    if counts["files"] >= nfiles:
                        break
            break
    dpkg.stdout.close()
    dpkg.kill()
    dpkg.wait()
    if counts["files"] < nfiles:
        sys.exit(f"workloads-inputs: {deb} has only {counts['files']} files of at most {TREE_MAX_FILE} bytes")
    os.rename(tmp, out)
    return counts


def tree_input(cache, nfiles):
    ver = candidate_version(TREE_PACKAGE)
    d = os.path.join(cache, "tree")
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, f"{TREE_PACKAGE}_{ver}-{nfiles}-cut{CUT_FORMAT}")
    if not (os.path.exists(base + ".tar") and os.path.exists(base + ".json")):
        deb = fetch_deb(cache, TREE_PACKAGE, ver)
        log(f"cutting {TREE_PACKAGE} {ver} to {nfiles} files")
        counts = cut_tree(deb, base + ".tar", nfiles)
        counts.update(package=TREE_PACKAGE, version=ver, max_file_bytes=TREE_MAX_FILE)
        with open(base + ".json.tmp", "w") as f:
            json.dump(counts, f, indent=1)
        os.rename(base + ".json.tmp", base + ".json")
    with open(base + ".json") as f:
        return base + ".tar", json.load(f)


# ------------------------------------------------------------------ the storm


def npm_tree(cache):
    """node_modules of vm-tests/workloads/ as `npm ci` installs it, once per lock."""
    src = os.path.join(HERE, "workloads")
    lock = open(os.path.join(src, "package-lock.json"), "rb").read()
    key = hashlib.sha256(lock + open(os.path.join(src, "package.json"), "rb").read()).hexdigest()[:12]
    d = os.path.join(cache, "npm", key)
    if not os.path.exists(os.path.join(d, ".done")):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(src, f), d)
        log("npm ci (once per lock)")
        subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund",
                        "--cache", os.path.join(cache, "npm-cache")],
                       cwd=d, check=True, stdout=sys.stderr)
        open(os.path.join(d, ".done"), "w").close()
    return d, key


def package_files(pkgdir):
    """Files of one installed package, relative to it, without nested
    node_modules (packages of their own in the lock)."""
    out = []
    for root, dirs, files in os.walk(pkgdir):
        rel = os.path.relpath(root, pkgdir)
        if rel == ".":
            dirs[:] = [x for x in dirs if x != "node_modules"]
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(os.path.normpath(os.path.join(rel, f)))
    return out


def pack_package(pkgdir, files, out):
    """The package's files as a .tgz under package/, like npm's tarballs
    (deterministic: gzip mtime 0, entries sorted)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        for rel in files:
            ti = t.gettarinfo(os.path.join(pkgdir, rel), arcname="package/" + rel)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            with open(os.path.join(pkgdir, rel), "rb") as f:
                t.addfile(ti, f)
    import gzip
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as g:
        g.write(raw.getvalue())


class Resolver:
    """The stat and read calls of Node's CommonJS resolution
    (Module._findPath: the node_modules paths walked up from the requiring
    directory, the request as a file, with each extension, as a package
    directory through package.json's "main", as index.*; the realpath of what
    was found), against the storm's files. package.json files and found
    modules are read once each (Node caches both); "exports" maps are not
    followed (the classic algorithm)."""

    def __init__(self, files, dirs, sizes, root):
        self.files, self.dirs, self.sizes, self.root = files, dirs, sizes, root
        self.ops = []
        self.read_done = set()
        self.real_done = set()
        self.resolved = 0
        self.unresolved = 0

    def stat(self, p):
        kind = "f" if p in self.files else "d" if p in self.dirs else "-"
        self.ops.append(f"S {kind} {p}")
        return kind

    def read(self, p):
        if p in self.read_done:
            return
        self.read_done.add(p)
        if p in self.files:
            self.ops.append(f"R {self.sizes[p]} {p}")
        else:
            self.ops.append(f"S - {p}")  # the open fails with ENOENT

    def try_file(self, p):
        return p if self.stat(p) == "f" else None

    def try_exts(self, p):
        for ext in NODE_EXTS:
            if self.try_file(p + ext):
                return p + ext
        return None

    def main_of(self, pkgjson):
        self.read(pkgjson)
        if pkgjson not in self.files:
            return None
        try:
            main = json.loads(self.pkg_text[pkgjson]).get("main")
        except (ValueError, AttributeError):
            return None
        return main if isinstance(main, str) and main else None

    def try_package(self, base):
        main = self.main_of(base + "/package.json")
        if not main:
            return self.try_exts(base + "/index")
        f = posixpath.normpath(posixpath.join(base, main))
        return self.try_file(f) or self.try_exts(f) or self.try_exts(f + "/index") or self.try_exts(base + "/index")

    def realpath(self, f):
        parts = f.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in self.real_done:
                self.real_done.add(p)
                self.stat(p)

    def require(self, fromdir, request):
        x = fromdir
        while True:
            if posixpath.basename(x) != "node_modules":
                base = f"{x}/node_modules/{request}"
                rc = self.stat(base)
                found = base if rc == "f" else None
                found = found or self.try_exts(base)
                if not found and rc == "d":
                    found = self.try_package(base)
                if found:
                    self.realpath(found)
                    self.read(found)
                    self.resolved += 1
                    return
            if x == self.root:
                break
            x = posixpath.dirname(x)
        self.unresolved += 1


def storm_inputs(cache, npmdir, k, stage):
    """Write npm/*.tgz, layout, probes, manifest and package.json for the first
    K packages of the lock into STAGE; returns the storm's counts."""
    lock = json.load(open(os.path.join(npmdir, "package-lock.json")))
    keys = [p for p in lock["packages"] if p.startswith("node_modules/")]
    keys = [p for p in keys if os.path.isdir(os.path.join(npmdir, p))][:k]
    root = "app"
    files, dirs, sizes, pkg_text, manifest, layout = set(), {root}, {}, {}, [], []
    os.makedirs(os.path.join(stage, "npm"))
    for i, key in enumerate(keys):
        pkgdir = os.path.join(npmdir, key)
        rel_files = package_files(pkgdir)
        pack_package(pkgdir, rel_files, os.path.join(stage, "npm", f"{i:04d}.tgz"))
        layout.append(f"{i:04d} {key}")
        for rel in rel_files:
            p = f"{root}/{key}/{rel}"
            data = open(os.path.join(pkgdir, rel), "rb").read()
            files.add(p)
            sizes[p] = len(data)
            manifest.append(f"{hashlib.sha256(data).hexdigest()}  {p}")
            if rel == "package.json":
                pkg_text[p] = data.decode("utf-8", "replace")
            d = posixpath.dirname(p)
            while d not in dirs:
                dirs.add(d)
                d = posixpath.dirname(d)
    r = Resolver(files, dirs, sizes, root)
    r.pkg_text = pkg_text
    app = json.load(open(os.path.join(npmdir, "package.json")))
    for dep in sorted(app.get("dependencies", {})):
        r.require(root, dep)
    for key in keys:
        pj = f"{root}/{key}/package.json"
        if pj not in pkg_text:
            continue
        try:
            deps = json.loads(pkg_text[pj]).get("dependencies") or {}
        except ValueError:
            continue
        for dep in sorted(deps):
            r.require(f"{root}/{key}", dep)
    for name, lines in (("layout", layout), ("probes", r.ops), ("manifest", manifest)):
        with open(os.path.join(stage, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    shutil.copy(os.path.join(npmdir, "package.json"), os.path.join(stage, "package.json"))
    return {
        "packages": len(keys), "files": len(files), "dirs": len(dirs),
        "bytes": sum(sizes.values()), "probe_ops": len(r.ops),
        "probe_enoent": sum(1 for o in r.ops if o.startswith("S - ")),
        "probe_reads": sum(1 for o in r.ops if o.startswith("R ")),
        "requires": r.resolved + r.unresolved, "unresolved": r.unresolved,
    }


def inputs_tar(cache, tree_counts, args):
    npmdir, lockkey = npm_tree(cache)
    key = f"{lockkey}-k{args.packages}-t{args.tx}-r{args.rows}-{tree_counts['version']}-{args.files}-cut{CUT_FORMAT}"
    out = os.path.join(cache, "inputs", f"inputs-{key}.tar")
    if os.path.exists(out):
        return out
    stage = os.path.join(cache, "inputs", f".stage-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    log(f"storm inputs: the first {args.packages} packages of the lock")
    storm = storm_inputs(cache, npmdir, args.packages, stage)
    params = {
        "TREE_PACKAGE": tree_counts["package"], "TREE_VERSION": tree_counts["version"],
        "TREE_TOP": tree_counts["top"], "TREE_FILES": tree_counts["files"],
        "TREE_DIRS": tree_counts["dirs"], "TREE_SYMLINKS": tree_counts["symlinks"],
        "TREE_BYTES": tree_counts["bytes"],
        "STORM_PACKAGES": storm["packages"], "STORM_FILES": storm["files"],
        "STORM_DIRS": storm["dirs"], "STORM_BYTES": storm["bytes"],
        "STORM_PROBE_OPS": storm["probe_ops"], "STORM_PROBE_ENOENT": storm["probe_enoent"],
        "STORM_PROBE_READS": storm["probe_reads"], "STORM_REQUIRES": storm["requires"],
        "STORM_UNRESOLVED": storm["unresolved"],
        "SQL_TX": args.tx, "SQL_ROWS": args.rows,
    }
    with open(os.path.join(stage, "params"), "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in params.items())
    with open(os.path.join(stage, "params.json"), "w") as f:
        json.dump(params, f, indent=1)
    tmp = atomic_dir_file(out)
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as t:
        # params first: the guest reads it before anything else
        for name in ["params", "params.json"] + sorted(os.listdir(stage)):
            if name in ("params", "params.json") and name in t.getnames():
                continue
            t.add(os.path.join(stage, name), arcname=name)
    os.rename(tmp, out)
    shutil.rmtree(stage)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=500, help="regular files of the source tree (full size: 50000)")
    ap.add_argument("--packages", type=int, default=15, help="npm packages of the storm (the lock has 461)")
    ap.add_argument("--tx", type=int, default=5, help="SQLite transactions")
    ap.add_argument("--rows", type=int, default=20, help="SQLite inserts per transaction")
    ap.add_argument("--cache", default=os.path.join(REPO, "build", "workloads"))
    args = ap.parse_args()
    for n in ("files", "packages", "tx", "rows"):
        if getattr(args, n) < 1:
            ap.error(f"--{n} must be at least 1")
    os.makedirs(args.cache, exist_ok=True)
    tree, counts = tree_input(args.cache, args.files)
    inputs = inputs_tar(args.cache, counts, args)
    print(f"tree {tree}")
    print(f"inputs {inputs}")


if __name__ == "__main__":
    main()
