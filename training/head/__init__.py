"""What runs in the Ray head pod beside the job, standard library only: the cold-start timeline,
the scale-up watch, and the Kubernetes API client they read through."""
