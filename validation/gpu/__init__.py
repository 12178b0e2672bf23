"""Real-GPU runs of the cases the fake-tensor harnesses measure (a session lent a GPU runs
`python -m validation.gpu run`); see __main__.py."""
