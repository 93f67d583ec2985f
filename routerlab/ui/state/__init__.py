"""What the handlers share and keep: the server's Resources and Limits, a visitor's Session, every field's check, the upload guard and the exports' budget, the Decoder that streams a run."""
