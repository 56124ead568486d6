# kvtier differential script: python differential.py --replay FILE
{
    'version': 1,
    'seed': 1116,
    'hybrid': False,
    'config': {
        'page_size': 1,
        'decode_input_tokens': 2,
        'max_batch_size': 1,
        'max_scheduled_tokens': 2,
        'enable_mixed_prefill_decode': False,
        'enable_kv_cache_events': True,
        'disable_l2_cache': False,
        'disable_prefix_cache': False,
        'num_device_pages': 8,
        'num_host_pages': 98,
    },
    'requests': [{'id': 'r01', 'arrive': 0, 'prompt': [1], 'gen': 4, 'abort_at': 19, 'reserve': {}}],
    'wb_delays': {},
    'max_steps': 400,
}
