#!/usr/bin/env python3
"""Summarises a `kernel_bench --timeline` CSV (one row per INT2-kernel CTA, DecodeTimelineSlot
words w0..w15) for one configuration label, e.g. `default/1x100000`.

Usage: scripts/gpu/timeline_summary.py TIMELINE.csv LABEL [SM_CLOCK_MHZ]

Prints per-phase quantiles (µs from the first CTA's entry; per-SM clocks converted at
SM_CLOCK_MHZ, default 1790), the spread of loop ends inside a CTA and between the two CTAs of an
SM, the number of warps in their main loop over time, and the loop end if every warp had run to
a common end (the loops' warp-µs over the peak warp count)."""
import csv
import statistics as st
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    path, label = sys.argv[1], sys.argv[2]
    clk = float(sys.argv[3]) if len(sys.argv) > 3 else 1790.0  # clocks per µs
    rows = [r for r in csv.DictReader(open(path)) if r['config'] == label]
    if not rows:
        print('no rows for', label, '; labels:', sorted({r['config'] for r in csv.DictReader(open(path))}))
        return 1
    t0 = min(int(r['w0']) for r in rows)
    ctas = []
    for r in rows:
        w = [int(r.get('w%d' % i) or 0) for i in range(24)]
        if w[2] == 0 or w[5] < w[2]:  # a CTA without a main loop (BF16 item): skip
            continue
        entry = (w[0] - t0) / 1000.0
        rel = lambda c: (c - w[2]) / clk + entry
        # Warps 0..3 in words 6..9, warps 4..7 of 8-warp CTAs in words 16..19 (words 20, 21: the
        # epilogue / states marks; 22, 23 of the first records: the rotation kernel's marks).
        wend = [rel(x) for x in w[6:10]] + [rel(x) for x in w[16:20] if x]
        ctas.append(dict(sm=w[1] & 0xff, entry=entry, table=rel(w[3]), query=rel(w[4]), loop=rel(w[5]), wend=wend,
                         part=rel(w[10]), end=rel(w[11]), done=rel(w[14]) if w[14] else None,
                         merge=rel(w[15]) if w[15] else None,
                         epi=rel(w[20]) if w[20] and not w[21] == 0 else None,
                         states=rel(w[21]) if w[21] else None))
    q = lambda v: 'min %.2f  med %.2f  max %.2f' % (min(v), st.median(v), max(v))
    print('%d INT2 CTAs with a main loop' % len(ctas))
    # Word 22 of the first records: the rotation kernel's CTAs' ends (%globaltimer).
    rot = [(int(r.get('w22') or 0) - t0) / 1000.0 for r in rows if int(r.get('w22') or 0)]
    if rot:
        print('rotation kernel CTAs end', q(rot))
        m = [int(r.get('w23') or 0) for r in rows if int(r.get('w22') or 0)]
        for i, name in enumerate(('its wait returned', 'queries loaded', 'queries rotated')):
            print('  %s (µs before its end)' % name, q([((x >> (21 * i)) & 0x1fffff) / 1000.0 for x in m]))
    for k in ('table', 'query', 'loop', 'part', 'end'):
        print('%-6s %s' % (k, q([c[k] for c in ctas])))
    print('warp loop ends inside a CTA: spread', q([max(c['wend']) - min(c['wend']) for c in ctas]))
    print('last warp end -> partial:', q([c['part'] - max(c['wend']) for c in ctas]))
    if all(c['done'] is not None for c in ctas):
        # Word 14: thread 0 after its warp's loop and copies (8-warp CTAs have no barrier there).
        print('last warp end -> thread 0 past its loop:', q([c['done'] - max(c['wend']) for c in ctas]))
        print('thread 0 past its loop -> partial:', q([c['part'] - c['done'] for c in ctas]))
    if all(c['states'] is not None for c in ctas):
        print('thread 0 past its loop -> epilogue done %s -> states in smem %s -> partial %s' % (
            q([c['epi'] - c['done'] for c in ctas]), q([c['states'] - c['epi'] for c in ctas]),
            q([c['part'] - c['states'] for c in ctas])))
    mg = [c for c in ctas if c['merge'] is not None]
    if mg:
        print('merging CTAs: %d; partial -> merge start %s; merge start -> end %s' % (
            len(mg), q([c['merge'] - c['part'] for c in mg]), q([c['end'] - c['merge'] for c in mg])))
        print('last partial %.2f, merge starts %s' % (max(c['part'] for c in ctas), q([c['merge'] for c in mg])))
    if ctas and len(ctas[0]['wend']) > 4:
        # Mean loop end of each warp index relative to its CTA's first warp end.
        nw = min(len(c['wend']) for c in ctas)
        print('mean loop end per warp index (µs after the CTA\'s first):',
              ' '.join('%.2f' % st.mean(c['wend'][i] - min(c['wend']) for c in ctas) for i in range(nw)))
    sms = {}
    for c in ctas:
        sms.setdefault(c['sm'], []).append(c)
    gaps = [abs(max(a['wend']) - max(b['wend'])) for a, b in (v for v in sms.values() if len(v) == 2)]
    print('SMs: %d, CTAs per SM %s' % (len(sms), {n: sum(1 for v in sms.values() if len(v) == n) for n in (1, 2, 3)}))
    if gaps:
        print('loop-end gap between the two CTAs of an SM:', q(gaps))
    ends = sorted(max(c['wend']) for c in ctas)
    print('CTA loop ends, quantiles 0/10/25/50/75/90/100%:',
          ' '.join('%.1f' % ends[int(f * (len(ends) - 1))] for f in (0, .1, .25, .5, .75, .9, 1)))
    step = 0.25
    bins = [0] * int(max(c['end'] for c in ctas) / step + 2)
    for c in ctas:
        for we in c['wend']:
            for b in range(int(c['loop'] / step), int(we / step)):
                bins[b] += 1
    print('warps in their main loop every 0.5 µs:', ' '.join(str(b) for b in bins[::2]))
    area, peak = sum(bins) * step, max(bins)
    start = st.median(c['loop'] for c in ctas)
    print('loop warp-µs %.0f; all %d warps to a common end from %.2f µs: %.2f µs' % (area, peak, start, start + area / peak))
    # The next launch's records (LABEL#2, the launch right after this one, back to back), in
    # %globaltimer ns: where one launch's period goes between its first CTA's entry and the next
    # launch's first CTA's entry.
    nxt = [r for r in csv.DictReader(open(path)) if r['config'] == label + '#2']
    if nxt:
        ns = lambda rs, k: [int(r['w%d' % k]) for r in rs if int(r['w%d' % k] or 0)]
        e1, e2 = min(ns(rows, 0)), min(ns(nxt, 0))
        end1 = max(ns(rows, 12))
        rot2 = ns(nxt, 22)
        print('launch period (first entry -> next launch\'s first entry) %.2f µs; this launch\'s CTAs: '
              'entry spread %.2f, last end %.2f; gap last end -> next first entry %.2f µs' % (
                  (e2 - e1) / 1e3, (max(ns(rows, 0)) - e1) / 1e3, (end1 - e1) / 1e3, (e2 - end1) / 1e3))
        if rot2:
            m = [int(r.get('w23') or 0) for r in nxt if int(r.get('w22') or 0)]
            wait = [x - ((y & 0x1fffff)) for x, y in zip(rot2, m)]
            print('next launch\'s rotation kernel: wait returned %s, CTAs end %s (µs after this launch\'s last end)' % (
                q([(w - end1) / 1e3 for w in wait]), q([(x - end1) / 1e3 for x in rot2])))
        loops = ns(rows, 13)
        if loops:
            print('this launch, µs after its first entry (%%globaltimer): loops start %s; CTA ends %s' % (
                q([(x - e1) / 1e3 for x in loops]), q([(x - e1) / 1e3 for x in ns(rows, 12)])))
    return 0


if __name__ == '__main__':
    sys.exit(main())
