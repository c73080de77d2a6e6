#!/usr/bin/env python3
"""Per-function instructions per request: callgrind_diff.py A.out B.out N [incl]
prints (B - A) / N for each function of callgrind_annotate (self, or inclusive)."""
import subprocess, sys, re
def load(f, incl):
    out = subprocess.run(['callgrind_annotate', '--threshold=100', f'--inclusive={"yes" if incl else "no"}', f], capture_output=True, text=True).stdout
    d = {}
    for line in out.splitlines():
        m = re.match(r'\s*([\d,]+) \([^)]*\)\s+(.*)', line) or re.match(r'\s*([\d,]+)\s+(\S.*)', line)
        if m:
            n = int(m.group(1).replace(',', ''))
            name = m.group(2)
            name = re.sub(r'^\S*:', '', name, count=1) if ':' in name.split(' ')[0] else name
            d[name] = d.get(name, 0) + n
    return d
a, b, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
incl = len(sys.argv) > 4 and sys.argv[4] == 'incl'
da, db = load(a, incl), load(b, incl)
rows = sorted(((db.get(k, 0) - da.get(k, 0)) / n, k) for k in set(da) | set(db))
tot = 0
for v, k in reversed(rows):
    if abs(v) < 15: continue
    print(f'{v:9.1f}  {k[:150]}')
