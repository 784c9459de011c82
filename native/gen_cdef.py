"""Regenerates libnftnl.cdef (cffi declarations) from the installed libnftnl-dev headers.

Run by hand when the libnftnl version changes: ``python native/gen_cdef.py``. Keeps only what
cffi can parse (no macros, no FILE or va_list functions) and only functions the shared library
actually exports (some headers declare functions the library does not ship).
"""

import re
import subprocess
import sys
from pathlib import Path

HEADERS = ["common", "table", "chain", "rule", "expr", "set", "gen", "batch", "udata", "object"]
PRELUDE = [
    "typedef struct _IO_FILE FILE;",
    "struct iovec { void *iov_base; size_t iov_len; };",
    "struct nlmsghdr { uint32_t nlmsg_len; uint16_t nlmsg_type; uint16_t nlmsg_flags;"
    " uint32_t nlmsg_seq; uint32_t nlmsg_pid; };",
]


def exported(lib: str) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines()}


def declarations(header: Path, symbols: set[str]) -> list[str]:
    src = header.read_text()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"#define(?:[^\n]*\\\n)*[^\n]*\n", "", src)
    src = re.sub(r"#(?:if|endif|include|else)[^\n]*\n", "", src)
    src = re.sub(r'extern "C" \{|^\}\s*$', "", src, flags=re.M)
    src = re.sub(r"__attribute__\s*\(\(.*?\)\)", "", src)
    kept = []
    for stmt in (s.strip() for s in src.split(";")):
        if not stmt or "FILE" in stmt or "va_list" in stmt:
            continue
        func = re.search(r"(\w+)\s*\([^()]*\)\s*$", stmt)
        if func and not stmt.startswith("enum") and func.group(1) not in symbols:
            continue
        kept.append(stmt + ";")
    return kept


def main() -> None:
    lib = sys.argv[1] if len(sys.argv) > 1 else "/usr/lib/x86_64-linux-gnu/libnftnl.so.11"
    symbols = exported(lib)
    lines = list(PRELUDE)
    for name in HEADERS:
        lines += declarations(Path(f"/usr/include/libnftnl/{name}.h"), symbols)
    (Path(__file__).parent / "libnftnl.cdef").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
