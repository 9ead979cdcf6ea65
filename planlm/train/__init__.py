"""planlm.train"""
