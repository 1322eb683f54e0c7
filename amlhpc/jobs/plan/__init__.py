"""Recipe + stack outputs + SKU catalog -> a job plan: tuning, DeepSpeed, cost, quota, goodput,
scaling studies. Talks to no Azure service.
"""
