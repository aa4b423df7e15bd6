"""Write digits.npz, a small two-domain dataset in the layout the `npz` dataset reads: scikit-learn's bundled
handwritten digits (1,797 images, 10 classes) at 32x32, once as they are ("plain") and once inverted ("inverted")."""

import numpy as np
from sklearn.datasets import load_digits

d = load_digits()
x = np.kron(d.images / 16.0 * 255.0, np.ones((4, 4))).round().astype(np.uint8)  # 8x8 -> 32x32, nearest
np.savez("digits.npz", x=np.concatenate([x, 255 - x]), y=np.concatenate([d.target, d.target]),
         domain=np.repeat(["plain", "inverted"], len(x)))
print(f"wrote digits.npz: {2 * len(x)} images of 32x32, 10 classes, domains plain and inverted")
