"""Generated environments; `synthetic_facts` is the embedded default of `make demo`."""
