from fast.cli import app

app()
