"""Weight formats for the model's linear layers and the per-step choice between them.

``formats`` packs a float weight into one format (dense, int8 or int4 weight-only, W8A8) and
multiplies by it; ``linear`` holds the formats a layer keeps and picks one per call by the
number of tokens in the batch; ``tuning`` measures which format is fastest at which batch size
on this machine (cached on disk) so ``--quantization auto`` dispatches by measurement.
"""
