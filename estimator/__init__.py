"""LLM GPU-memory estimator: what each GPU holds at the peak of a training step.

Plain Python: no Streamlit, no pandas, no I/O at import. Start from `estimate()`.
"""
