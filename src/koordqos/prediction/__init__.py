"""Node prediction (docs/prediction.md): histograms, models, the Prod-reclaimable predictors and the
checkpoint format. Pure but for `checkpoint.CheckpointDir`; the training loop and the report fields are in
`koordqos.report.prediction`."""
