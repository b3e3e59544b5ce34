"""numpy (float64) references for the layers."""
import numpy as np


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  n, _, H, W = x.shape
  cout, cpg, kh, kw = w.shape
  oh, ow = (H - dilation * (kh - 1) - 1) // stride + 1, (W - dilation * (kw - 1) - 1) // stride + 1
  out, opg = np.zeros((n, cout, oh, ow)), cout // groups
  for g in range(groups):
    xs, ws = x[:, g * cpg:(g + 1) * cpg], w[g * opg:(g + 1) * opg]
    for i in range(kh):
      for j in range(kw):
        patch = xs[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride, j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
        out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
  return out if b is None else out + b.reshape(1, -1, 1, 1)


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
  """Each input pixel scatters its kernel-weighted copy to stride-spaced positions; then the padding is cropped."""
  n, cin, H, W = x.shape
  _, opg, kh, kw = w.shape
  ipg = cin // groups
  full_h, full_w = (H - 1) * stride + dilation * (kh - 1) + 1, (W - 1) * stride + dilation * (kw - 1) + 1
  out = np.zeros((n, opg * groups, full_h + output_padding, full_w + output_padding))
  for g in range(groups):
    xs, ws = x[:, g * ipg:(g + 1) * ipg].astype(np.float64), w[g * ipg:(g + 1) * ipg]
    for i in range(kh):
      for j in range(kw):
        rows = slice(i * dilation, i * dilation + stride * (H - 1) + 1, stride)
        cols = slice(j * dilation, j * dilation + stride * (W - 1) + 1, stride)
        out[:, g * opg:(g + 1) * opg, rows, cols] += np.einsum("nchw,co->nohw", xs, ws[:, :, i, j])
  oh, ow = full_h - 2 * padding + output_padding, full_w - 2 * padding + output_padding
  out = out[:, :, padding:padding + oh, padding:padding + ow]
  return out if b is None else out + b.reshape(1, -1, 1, 1)


def normalize(x, axes, eps):
  x = x.astype(np.float64)
  mean = x.mean(axes, keepdims=True)
  return (x - mean) / np.sqrt(x.var(axes, keepdims=True) + eps)
