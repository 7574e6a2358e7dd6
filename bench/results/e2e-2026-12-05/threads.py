"""Per-thread CPU of the rolloutbus processes during one e2e bench run (polls /proc every 0.2 s)."""
import collections, os, pathlib, subprocess, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout (this file is bench/results/<dir>/threads.py)
LOG = os.path.join(tempfile.gettempdir(), "threads-bench.log")
TCK = os.sysconf("SC_CLK_TCK")
bench = subprocess.Popen([".venv/bin/python", "-m", "bench.bench_e2e", "--spans", "100000", "--mixes", "default",
                          "--systems", "rolloutbus"], cwd=ROOT, stdout=open(LOG, "w"),
                         stderr=subprocess.STDOUT)
last = {}  # (role, tid) -> (name, ticks)
first = {}
def role_of(cmd):
    for r, k in (("gateway", " gateway "), ("worker", " process "), ("store", " store ")):
        if k in cmd and "rolloutbus.cli" in cmd: return r
    if "kafka" in cmd.lower() and "java" in cmd: return "broker"
    return None
def cmdline(q):
    try:
        return open(f"/proc/{q}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
lg_seen = None
while bench.poll() is None:
    if "spans per CPU-s" in open(LOG).read():
        break  # the bench's window closed
    if lg_seen is None and any("--loadgen" in cmdline(q) for q in os.listdir("/proc") if q.isdigit()):
        lg_seen = time.monotonic()
    freeze = lg_seen is not None and time.monotonic() - lg_seen > 0.8
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        role = role_of(" " + cmd + " ")
        if role is None: continue
        try: tids = os.listdir(f"/proc/{pid}/task")
        except OSError: continue
        for tid in tids:
            try:
                st = open(f"/proc/{pid}/task/{tid}/stat").read()
                comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            except OSError: continue
            f = st[st.rfind(")") + 2:].split()
            ticks = int(f[11]) + int(f[12])
            if not freeze or (role, tid) not in first:
                first[(role, tid)] = ticks
            last[(role, tid)] = (comm, ticks)
    time.sleep(0.2)
by = collections.defaultdict(collections.Counter)
for (role, tid), (comm, ticks) in last.items():
    by[role][comm] += (ticks - first[(role, tid)]) / TCK
for role, c in by.items():
    print(role, round(sum(c.values()), 2), "CPU-s (while polled)")
    for comm, s in c.most_common(12): print(f"   {s:6.2f} {comm}")
bench.wait()
print(open(LOG).read()[-1200:])
