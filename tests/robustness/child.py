"""Run in a child process by the cache tests (a crash there is observed, not fatal): realizes kernels whose results are
known, through the compile cache in $PLUGRAD_CACHE_DIR, and prints them with every CacheWarning it saw."""
import warnings

from plugrad import Tensor
from plugrad.diskcache import CacheWarning

warnings.simplefilter("always", CacheWarning)
with warnings.catch_warnings(record=True) as seen:
  warnings.simplefilter("always", CacheWarning)
  small = (Tensor.arange(8).float() * 2).sum().item()  # 56.0 (the number a damaged entry once turned into 0.0)
  big = Tensor.ones(1 << 22).contiguous().sum().item()  # parallel: loads the native pool helper library too
for w in seen: print("WARNING", str(w.message).replace("\n", " "))
print("RESULT", small, big)
