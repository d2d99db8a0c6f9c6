"""kvlab.predict: one decode-attention launch's time at any point, from a closed form fitted to
the H200's recordings, with how far to trust it.

`decode_launch(model_or_shape, batch, context, ...)` returns a `Prediction`: time (ms), GB/s and
share of the copy roofline, "measured" (the recording), "interpolated" or "extrapolated", and
an error band. The modules follow the data: point (the inputs, checked) -> closed_form (bytes,
plan, time) -> recorded (the recordings) -> fit, validate (constants, held-out error) ->
decode (the answer) -> paper (the L2-prefetch paper's H20), report (docs/predict.md).
"""

from kvlab.predict.decode import Prediction, decode_launch, prefetch_speedup

__all__ = ["Prediction", "decode_launch", "prefetch_speedup"]
