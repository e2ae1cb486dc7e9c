import json,sys,statistics as st
for f in sys.argv[1:]:
    d=json.load(open(f))
    cases=[c['name'] for c in d['cases']]
    base,other=cases[0],cases[1]
    by={}
    for s in d['samples']:
        by.setdefault((s['test'],s['round']),{})[s['case']]=st.median(s['values'])
    print(f.split('/')[-1], f"{other} / {base}", d['rounds'], 'rounds')
    for t in d['tests']:
        r=sorted(v[other]/v[base] for (tt,_),v in by.items() if tt==t and base in v and other in v)
        print(f"  {t}: median paired {st.median(r):.3f}  range [{r[0]:.3f}, {r[-1]:.3f}]  n={len(r)}  medians {d['summary'][other][t]['median']/d['summary'][base][t]['median']:.3f}")
