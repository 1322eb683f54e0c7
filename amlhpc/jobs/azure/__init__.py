"""What talks to Azure ML from the command line: sign-in and submission.
"""
