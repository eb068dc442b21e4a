"""Compiler launcher: runs the compile and prints how long each kernel translation unit took."""
import os
import subprocess
import sys
import time

start = time.time()
rc = subprocess.call(sys.argv[1:])
src = next((a for a in sys.argv[1:] if a.endswith(".cu")), "?")
print(f"[compile-time] {time.time() - start:6.1f} s  {os.path.basename(src)}", flush=True)
sys.exit(rc)
