"""A progress bar: tqdm when importable, else a one-line text bar on stderr. No torch, no GPU."""
import sys
import time


class _TextBar:
    """Redraws one line on a terminal; in a log (not a tty) prints a line at each further tenth instead."""

    def __init__(self, total, desc="", width=30, stream=None):
        self.total, self.desc, self.width = max(1, total), desc, width
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.n, self.note, self.t0, self.tenth = 0, "", time.monotonic(), -1
        self._draw()

    def update(self, n=1):
        self.n += n
        self._draw()

    def set_postfix_str(self, note):
        self.note = note
        self._draw()

    def write(self, msg):
        self.stream.write(("\r\033[K" if self.tty else "") + msg + "\n")
        self._draw()

    def _draw(self):
        frac = min(1.0, self.n / self.total)
        if not self.tty:
            if int(frac * 10) > self.tenth:
                self.tenth = int(frac * 10)
                self.stream.write(f"{self.desc} {self.n}/{self.total} {time.monotonic() - self.t0:.0f}s "
                                  f"{self.note}\n")
                self.stream.flush()
            return
        fill = int(frac * self.width)
        elapsed = time.monotonic() - self.t0
        eta = f" eta {elapsed / frac - elapsed:4.0f}s" if 0 < frac < 1 else ""
        self.stream.write(f"\r\033[K{self.desc} [{'#' * fill}{'.' * (self.width - fill)}] "
                          f"{self.n}/{self.total} {elapsed:4.0f}s{eta} {self.note}")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


class _TqdmBar:
    def __init__(self, total, desc):
        from tqdm import tqdm
        self._tqdm = tqdm
        self.bar = tqdm(total=total, desc=desc, dynamic_ncols=True)

    def update(self, n=1):
        self.bar.update(n)

    def set_postfix_str(self, note):
        self.bar.set_postfix_str(note)

    def write(self, msg):
        self._tqdm.write(msg)

    def close(self):
        self.bar.close()


def progress(total, desc=""):
    """An object with update(n), set_postfix_str(s), write(msg) and close()."""
    try:
        return _TqdmBar(total, desc)
    except ImportError:
        return _TextBar(total, desc)
