#!/usr/bin/env python3
"""Lists pairs of source files that import each other (`use crate::…`, `use super::…`,
`use self::…`, one level of braces expanded), across the workspace's library and binary
sources (tests, examples and benches aside). Run from the repository root:
`python3 tools/import_cycles.py`; prints each mutual pair and the count."""
import re,os,subprocess,sys
files=[f for f in subprocess.check_output(['git','ls-files','*.rs']).decode().split() if '/tests/' not in f and not f.startswith('tests/') and not f.startswith('examples') and not f.startswith('validation') and not f.startswith('benches')]
# map module path -> file per crate
def crate_root(f):
    if f.startswith('crates/'):
        parts=f.split('/'); return '/'.join(parts[:3])  # crates/X/src
    return 'src'
mods={}
for f in files:
    root=crate_root(f); rel=f[len(root)+1:]
    if rel in ('lib.rs','main.rs'): m=[]
    else:
        rel=rel[:-3]; p=rel.split('/')
        if p[-1]=='mod': p=p[:-1]
        m=p
    mods[(root,tuple(m))]=f
def resolve(root,cur,path):
    # path list of segments after crate:: or relative via super/self
    segs=path
    best=None
    for k in range(len(segs),0,-1):
        if (root,tuple(segs[:k])) in mods: return mods[(root,tuple(segs[:k]))]
    return None
edges={}
for (root,m),f in mods.items():
    txt=open(f).read()
    is_mod_file = f.endswith('mod.rs') or f.endswith('lib.rs') or f.endswith('main.rs')
    here=list(m)
    uses=[]
    for use in re.findall(r'\buse\s+([^;]+);', txt):
        use=re.sub(r'\s+','',use)
        m2=re.match(r'^((?:crate|super|self)(?:::\w+)*)::\{(.*)\}$', use)
        if m2:
            for part in m2.group(2).split(','):
                part=part.split('{')[0].strip(':')
                if part: uses.append(m2.group(1)+'::'+part)
        else: uses.append(use)
    for use in uses:
        for base in re.findall(r'^(crate|super|self)((?:::\w+)*)', use):
            kind,rest=base; segs=[s for s in rest.split('::') if s]
            if kind=='crate': full=segs
            elif kind=='self': full=here+segs if is_mod_file else here[:-1]+segs if False else here+segs
            else:
                parent = here if is_mod_file else here[:-1]
                parent = parent[:-1] if is_mod_file else parent
                # super from file module m: parent of m
                full=(here[:-1] if True else here)+segs
            # expand braces
            t=resolve(root,here,full)
            if t and t!=f: edges.setdefault(f,set()).add(t)
bad=[(a,b) for a in edges for b in edges[a] if a<b and a in edges.get(b,set())]
for a,b in bad: print('CYCLE',a,b)
print(sum(len(v) for v in edges.values()), "imports between files")
print(len(bad),'mutual pairs')
