"""AWS infrastructure: typed stack config, network, EKS cluster and node groups, storage, cost.

Never imports torch or ray: the Pulumi program must start fast in a small virtualenv.
"""
