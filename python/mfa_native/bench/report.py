"""What the benchmark prints and writes: the progress line, the table, the plot."""

import subprocess
import sys
import threading
import time

from mfa_native.bench import roof

__all__ = ["Progress", "table", "plot", "cpu_model", "roof_lines"]

_MIB = 2**20


def cpu_model():
    """The CPU's marketing name (/proc/cpuinfo on Linux, sysctl on macOS), or None."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as cpuinfo:
                for line in cpuinfo:
                    key, _, value = line.partition(":")
                    if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                        return value.strip()
        except OSError:
            return None
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    return None


class Progress:
    """One line on stderr: calls done (weighted by an estimate of their time, so the percentage
    and the remaining-time estimate follow the work, not the count), elapsed time, what runs
    now.

    On a terminal it is redrawn in place at every call and, by a background thread, twice a
    second while a long call runs, so that the clock keeps moving. Elsewhere (a log, a pipe)
    it prints one line per finished case and pass.
    """

    def __init__(self, total, stream=sys.stderr, live=None):
        self.total = max(float(total), 1.0)
        self.done = 0.0
        self.stream = stream
        self.started = time.perf_counter()
        self.live = stream.isatty() if live is None else live
        self.label = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None
        if self.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def _tick(self):
        while not self._stop.wait(0.5):
            self._draw()

    def _line(self):
        fraction = min(self.done / self.total, 1.0)
        elapsed = time.perf_counter() - self.started
        width = 24
        filled = int(width * fraction)
        remaining = elapsed * (1 - fraction) / fraction if fraction > 0.01 else None
        eta = "" if remaining is None else f", ~{remaining:.0f}s left"
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {100 * fraction:3.0f}% "
            f"{elapsed:6.1f}s{eta}  {self.label}"
        )

    def _draw(self):
        with self._lock:
            if self.live:
                self.stream.write("\r\033[K" + self._line()[:160])
                self.stream.flush()

    def step(self, label, work=1.0):
        """A call of the given work (any unit, the same for every call) begins."""
        with self._lock:
            self.label = label
        self._draw()
        with self._lock:
            self.done += work

    def skip(self, work):
        """Work that will not be done (a peer skips or fails)."""
        with self._lock:
            self.done += work

    def finished(self, label):
        """A case and pass are done."""
        if not self.live:
            with self._lock:
                self.label = label
                self.stream.write(self._line() + "\n")
                self.stream.flush()

    def close(self):
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


def _format(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def _number(value, missing="-"):
    """Three significant digits below 100, no decimals above: ms and rates span 1e-3 to 1e5."""
    if value is None:
        return missing
    return format(value, ".0f" if abs(value) >= 100 else ".3g")


def _mib(count):
    return None if count is None else count / _MIB


def roof_lines(roofs, missing, threads):
    """The header lines that state the roofs."""
    if not roofs and not missing:
        return []
    lines = [
        f"roofs, {threads} threads at once, measured before and after the cases (the best "
        "trial; each measurement's median in parentheses):"
    ]
    titles = {"fma_f32": "fp32 FMA", "dot_bf16": "bf16 dot product", "read": "read bandwidth"}
    for name, title in titles.items():
        if name in roofs:
            r = roofs[name]
            medians = ", ".join(f"{median:.0f}" for median in r.medians)
            lines.append(f"  {title:17}{r.rate:7.0f} {r.unit:8}({medians})  {r.isa}: {r.method}")
        elif name in missing:
            lines.append(f"  {title:17}   none  {missing[name]}")
    return lines


def table(rows, peers, tera):
    """The report as aligned text; mfa's rates in TFLOPS when tera, else GFLOP/s, and "busy",
    the threads mfa's calls kept busy (process CPU time / wall time). Columns that no row
    fills (GPU time, roof, kernel, memory) are left out."""
    others = [peer for peer in peers if peer != "mfa"]
    results = [result for row in rows for result in row["results"].values()]
    gpu = any(row["results"].get("mfa", {}).get("gpu_ms") is not None for row in rows)
    memory = any(result.get("peak_extra_bytes") is not None for result in results)
    roofed = any(row["results"].get("mfa", {}).get("roof") for row in rows)
    kernels = {
        peer for row in rows for peer, result in row["results"].items() if result.get("kernel")
    }
    clock = "gpu_" if gpu else ""
    prefix = "GPU " if gpu else ""
    header = ["config", "pass", "mfa ms"] + (["GPU ms"] if gpu else [])
    header += [prefix + ("TFLOPS" if tera else "GFLOP/s"), prefix + "GINSTRS"]
    header += (["roof", "% roof"] if roofed else []) + ["busy"]
    header += ["MiB extra"] if memory else []
    for peer in others:
        header += [f"{peer} ms", f"x {peer}"]
        header += ([f"{peer} kernel"] if peer in kernels else []) + (
            [f"{peer} MiB"] if memory else []
        )
    lines = [header]
    for row in rows:
        mfa = row["results"].get("mfa", {})
        gflops = mfa.get(clock + "gflops")
        line = [row["config_label"], row["pass"], _number(mfa.get("ms"))]
        if gpu:
            line.append(_number(mfa.get("gpu_ms")))
        line += [
            _number(None if gflops is None else gflops / 1e3 if tera else gflops),
            _number(mfa.get(clock + "ginstrs")),
        ]
        if roofed:
            fraction = mfa.get("roof_fraction")
            line += [
                roof.SHORT.get(mfa.get("roof"), "-"),
                _format(None if fraction is None else 100 * fraction, ".0f"),
            ]
        line.append(_format(mfa.get("threads_busy"), ".2f"))
        if memory:
            line.append(_format(_mib(mfa.get("peak_extra_bytes")), ".1f"))
        for peer in others:
            result = row["results"].get(peer, {})
            missing = "n/a" if "skipped" in result else "err" if "error" in result else "-"
            time_cell = _number(result.get("ms"), missing)
            if result.get("disagrees"):
                time_cell += " !"
            line += [time_cell, _format(result.get("speedup_of_mfa"), ".2f")]
            if peer in kernels:
                line.append(result.get("kernel", "-"))
            if memory:
                line.append(_format(_mib(result.get("peak_extra_bytes")), ".1f"))
        lines.append(line)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            str(cell).rjust(width) if i else str(cell).ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        )
        for line in lines
    )


def plot(rows, path):
    """A PNG of GFLOP/s (wall time) against N per pass and dtype, for the square cases without
    a window; False (said on stderr) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed; no plot written", file=sys.stderr)
        return False
    series = {}
    for row in rows:
        config = row["config"]
        if config["window"] is not None or config["seq"] != config["seq_k"]:
            continue
        panel = (row["pass"], config["dtype"])
        for peer, result in row["results"].items():
            if result.get("gflops") is None:
                continue
            shape = (config["batch"], config["heads"], config["kv_heads"])
            key = (peer, config["dim"], config["causal"], shape)
            series.setdefault(panel, {}).setdefault(key, []).append(
                (config["seq"], result["gflops"])
            )
    if not series:
        return False
    # B and H are named only where a run mixes several (the shapes grid).
    shapes = {key[3] for lines in series.values() for key in lines}
    # Colour says which peer, line style which head dimension, marker whether causal.
    colours = {"mfa": "tab:blue", "torch": "tab:orange", "mlx": "tab:red", "numpy": "tab:green"}
    dims = sorted({key[1] for lines in series.values() for key in lines})
    styles = ["-", "--", ":", "-."]
    panels = sorted(series)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        for (peer, dim, causal, shape), points in sorted(series[panel].items()):
            points.sort()
            batch, heads, kv_heads = shape
            heads = f"{heads}/{kv_heads}" if kv_heads != heads else f"{heads}"
            named = f" B{batch} H{heads}" if len(shapes) > 1 else ""
            axis.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                color=colours.get(peer),
                marker="x" if causal else "o",
                linestyle=styles[dims.index(dim) % len(styles)],
                label=f"{peer} D={dim}{named}{' causal' if causal else ''}",
            )
        axis.set_xscale("log", base=2)
        axis.set_xlabel("N")
        axis.set_ylabel("GFLOP/s (wall time)")
        axis.set_title(f"{panel[1]} {panel[0]}")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
