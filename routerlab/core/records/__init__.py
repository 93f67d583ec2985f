"""Plain records of a run and what is measured on it: Step and Trace, the quality meter against the full model, where a text leaves the full model's answer."""
