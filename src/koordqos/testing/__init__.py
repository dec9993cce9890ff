"""Importable test doubles: synthetic node trees, fake servers, mock runtimes."""
