"""How the workers talk: which transport NCCL really uses (EFA or a silent TCP fallback), the
link bandwidth probe, and the step profile split into compute and exposed communication."""
